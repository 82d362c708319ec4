// A whole job in one process (in_process_job.h) whose buffers are never reused while the job runs: built and
// run by tests/test_cpp_unit.py, and under ASan+UBSan and ThreadSanitizer by tests/test_sanitizers.py, which
// must find nothing (senders, receivers, the aggregator, the buffer pool and the request tracker across threads).
#include "in_process_job.h"

int main() {
  return p3test::RunTests({
      {"in_process_job_sums_every_iteration", [] { p3test::RunInProcessJob(false); }},
  });
}
