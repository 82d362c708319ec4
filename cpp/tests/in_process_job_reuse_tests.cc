// A whole job in one process (in_process_job.h) that pushes keys in place (out == grad) and refills its
// gradients after each wait, as MXNet does: built and run by tests/test_cpp_unit.py, and under ASan+UBSan and
// ThreadSanitizer by tests/test_sanitizers.py. Under ThreadSanitizer it shows that nothing in the worker orders
// the sender's last read of a borrowed gradient before the operation's completion (see test_sanitizers.py).
#include "in_process_job.h"

int main() {
  return p3test::RunTests({
      {"in_process_job_reusing_buffers_sums_every_iteration", [] { p3test::RunInProcessJob(true); }},
  });
}
