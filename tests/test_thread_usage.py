"""Each thread's CPU in a run's timed window (benchmarks/emulation/thread_usage.py): interpolation between the
scanner's samples, roles from the environment, and the busiest process's threads per role. Unit tests on a fake
/proc tree; the real threads are measured in test_thread_cap.py's system tests."""

import pathlib

import pytest

from benchmarks.emulation import thread_usage


def _thread(proc: pathlib.Path, pid: int, tid: int, name: str, cpu_ns: int, environ: str = "",
            wchan: str = "0") -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "comm").write_text(name + "\n")
    (task / "schedstat").write_text(f"{cpu_ns} 1000 7\n")
    (task / "wchan").write_text(wchan)  # the kernel writes no newline; "0" while the thread runs
    (proc / str(pid) / "environ").write_text(environ)


@pytest.mark.unit
def test_usage_in_a_window_is_interpolated_between_samples():
    track = thread_usage.Track(0, 1, "p3-consume", [(10.0, 1.0, 0.0), (12.0, 3.0, 1.0), (14.0, 3.5, 1.0)])
    assert track.at(9.0) == (1.0, 0.0)  # before the first sample: the first
    assert track.at(11.0) == pytest.approx((2.0, 0.5))
    assert track.at(20.0) == (3.5, 1.0)  # after the last (the thread exited): the last
    assert track.between(11.0, 13.0) == pytest.approx((1.25, 0.5))


@pytest.mark.unit
def test_roles_come_from_ps_lites_or_p3kvs_variable_and_default_to_worker():
    assert thread_usage.role_of("PATH=/bin\0DMLC_ROLE=server\0") == "server"
    assert thread_usage.role_of("P3_ROLE=scheduler\0HOME=/root\0") == "scheduler"
    assert thread_usage.role_of("DMLC_ROLE=\0P3_ROLE=server\0") == "server"  # an empty variable says nothing
    assert thread_usage.role_of("HOROVOD_RANK=1\0") == "worker"
    assert thread_usage.role_of("") == "worker"  # unreadable (the process exited)


@pytest.mark.unit
def test_the_summary_lists_each_roles_busiest_process_busiest_thread_first(tmp_path):
    proc, cap = tmp_path / "proc", tmp_path / "t21"
    cap.mkdir()
    usage = thread_usage.ThreadUsage(proc)
    server = "DMLC_ROLE=server\0"
    # Two server processes (hosts 0 and 1) and a worker; 0.1 cores per thread; samples at t = 0 and t = 10.
    _thread(proc, 20, 20, "python", 0, server)
    _thread(proc, 20, 21, "ZMQbg/IO/0", 0, server, "do_epoll_wait")
    _thread(proc, 30, 30, "python", 0, server)
    _thread(proc, 40, 40, "python", 0)
    threads = {20: (0, 20, None), 21: (0, 20, cap), 30: (1, 30, None), 40: (1, 40, None)}
    (cap / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    usage.sample(threads, 0.0)
    _thread(proc, 20, 20, "python", 200_000_000, server)  # 0.2 s: 20% of one dilated CPU over 10 s
    _thread(proc, 20, 21, "ZMQbg/IO/0", 900_000_000, server)  # 0.9 s: 90%, throttled 4 s of the 10
    _thread(proc, 30, 30, "python", 300_000_000, server)  # the other server: 0.3 s in all, less than 1.1 s
    _thread(proc, 40, 40, "python", 500_000_000)
    (cap / "cpu.stat").write_text("nr_periods 100\nnr_throttled 40\nthrottled_time 4000000000\n")
    usage.sample(threads, 10.0)
    assert usage.summary(0.0, 10.0, 0.1) == {"server": [["ZMQbg/IO/0", 90.0, 40.0, "epoll"],
                                                        ["python", 20.0, 0.0, "main"]],
                                             "worker": [["python", 50.0, 0.0, "main"]]}
    assert usage.summary(0.0, 10.0, 0.1, top=1)["server"] == [["ZMQbg/IO/0", 90.0, 40.0, "epoll"]]
    assert usage.summary(5.0, 5.0, 0.1) == {}  # an empty window says nothing


@pytest.mark.unit
def test_a_thread_that_names_itself_after_its_first_sample_is_listed_by_its_new_name(tmp_path):
    proc = tmp_path / "proc"
    usage = thread_usage.ThreadUsage(proc)
    _thread(proc, 50, 51, "python", 0, "P3_ROLE=server\0")
    usage.sample({51: (0, 50, None)}, 0.0)
    _thread(proc, 50, 51, "p3-consume", 100_000_000, "P3_ROLE=server\0")  # cpp/src/thread_name.h, once started
    usage.sample({51: (0, 50, None)}, 1.0)
    assert usage.summary(0.0, 1.0, 0.5) == {"server": [["p3-consume", 20.0, 0.0, ""]]}  # never seen asleep
    (proc / "50" / "task" / "51" / "schedstat").unlink()  # exited: no sample, the track keeps its last
    usage.sample({51: (0, 50, None)}, 2.0)
    assert len(usage.tracks[51].samples) == 2


@pytest.mark.unit
def test_a_thread_is_known_by_where_it_sleeps_most_often_and_a_running_thread_says_nothing(tmp_path):
    proc = tmp_path / "proc"
    usage = thread_usage.ThreadUsage(proc)
    waits = ["futex_do_wait", "0", "poll_schedule_timeout.constprop.0", "poll_schedule_timeout.constprop.0"]
    for k, wchan in enumerate(waits):  # ps-lite's receiving thread: in zmq_msg_recv's poll() more than on a futex
        _thread(proc, 60, 62, "python", 10_000_000 * k, "DMLC_ROLE=worker\0", wchan)
        _thread(proc, 60, 60, "python", 0, "DMLC_ROLE=worker\0", "do_epoll_wait")  # main, wherever it waits
        usage.sample({60: (0, 60, None), 62: (0, 60, None)}, float(k))
    assert usage.tracks[62].waits == {"futex": 1, "poll": 2}  # the running sample ("0") counts nowhere
    assert [t[3] for t in usage.summary(0.0, 3.0, 1.0)["worker"]] == ["poll", "main"]
    assert thread_usage.wait_of("do_epoll_wait") == "epoll"
    assert thread_usage.wait_of("sk_wait_data\n") == "recv"  # a thread blocked in a socket read
    assert thread_usage.wait_of("some_new_kernel_function") == "some_new_kernel_function"  # kept as it is
    assert thread_usage.wait_of("") == ""  # unreadable: the thread exited
