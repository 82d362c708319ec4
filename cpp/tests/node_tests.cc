// Unit tests of the Node base (cpp/src/node.h): a failing node's last words reach every peer it names, each as
// one NODE_FAILED frame from its rank carrying the reason, a peer that is gone or missing holds back no other,
// and the node names itself by role and rank. Over socketpairs: no network, no scheduler.
// Built and run by tests/test_cpp_worker_parts.py.
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "connection.h"
#include "node.h"

namespace {

using namespace p3;

// A node with a rank, as Start would leave it (the scheduler link is never used here).
class TestNode : public Node {
 public:
  TestNode(Role role, int rank) : Node(NodeConfig(), role) { rank_ = rank; }
  const Counters& counters() const { return counters_; }
};

// The node's end and the peer's end of one connection.
struct Pair {
  std::shared_ptr<Connection> node_end;
  std::unique_ptr<Connection> peer_end;
};

Pair MakePair(Counters* counters, const std::string& name) {
  int fds[2] = {-1, -1};
  Pair p;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::fprintf(stderr, "socketpair failed\n");
    ++p3test::FailedChecks();
    return p;
  }
  p.node_end = std::make_shared<Connection>(Socket(fds[0]), name, 1 << 20, counters);
  static Counters peer_counters;  // the peers' (atomic) counters; nothing here reads them
  p.peer_end = std::make_unique<Connection>(Socket(fds[1]), "node", 1 << 20, &peer_counters);
  p.peer_end->SetReceiveTimeout(10.0);  // a lost frame fails the test instead of hanging it
  return p;
}

// The next frame on `peer` must be last words from `sender` saying `why`.
void ExpectLastWords(Connection* peer, int sender, const std::string& why) {
  Header h;
  std::string text;
  CHECK(peer->ReadHeader(&h).ok());
  CHECK(h.command == Command::kNodeFailed && h.sender == sender && h.payload_bytes == why.size());
  CHECK(peer->ReadPayload(&text, h.payload_bytes).ok() && text == why);
}

void TestLastWordsReachEveryPeer() {
  TestNode node(Role::kServer, 2);
  Counters unused;
  std::vector<Pair> pairs;
  for (int i = 0; i < 3; ++i) pairs.push_back(MakePair(&unused, "worker " + std::to_string(i)));
  const std::string why = "server 2: the update function raised ValueError";
  node.SayLastWords({pairs[0].node_end, nullptr, pairs[1].node_end, pairs[2].node_end}, why);  // null: skipped
  for (Pair& p : pairs) ExpectLastWords(p.peer_end.get(), 2, why);
  CHECK(unused.sent[static_cast<int>(Command::kNodeFailed)].load() == 3);
}

void TestAPeerThatIsGoneHoldsBackNoOther() {
  TestNode node(Role::kWorker, 0);
  Counters counters;
  Pair gone = MakePair(&counters, "server 0"), alive = MakePair(&counters, "server 1");
  gone.peer_end.reset();  // the peer closed its end: the write fails (EPIPE) without a signal
  node.SayLastWords({gone.node_end, alive.node_end}, "worker 0 failed: interrupted");
  ExpectLastWords(alive.peer_end.get(), 0, "worker 0 failed: interrupted");
}

void TestANodeIsNamedByRoleAndRank() {
  CHECK(TestNode(Role::kServer, 3).Name() == "server 3");
  CHECK(TestNode(Role::kWorker, 0).Name() == "worker 0");
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestLastWordsReachEveryPeer),
      RUN(TestAPeerThatIsGoneHoldsBackNoOther),
      RUN(TestANodeIsNamedByRoleAndRank),
  });
}
