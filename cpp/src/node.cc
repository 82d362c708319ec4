#include "node.h"

#include "frame_builder.h"

namespace p3 {

Node::Node(NodeConfig config, Role role)
    : config_(std::move(config)), role_(role), trace_(config_.trace), scheduler_(config_, role, &counters_) {}

std::string Node::Name() const { return std::string(RoleName(role_)) + " " + std::to_string(rank_); }

void Node::SayLastWords(const std::vector<std::shared_ptr<Connection>>& peers, const std::string& why,
                        double timeout_s) const {
  const Header note = ControlFrame(Command::kNodeFailed, rank_, why.size());
  for (const auto& conn : peers) {
    if (conn) conn->SendLastWords(note, why.data(), timeout_s);
  }
}

}  // namespace p3
