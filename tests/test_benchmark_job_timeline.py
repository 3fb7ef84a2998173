"""The job timeline's reading of Spark's REST API: times and lines as the driver's UI gives them."""

from __future__ import annotations

from benchmarks.job_timeline import job_lines, task_lines, timestamp


def test_a_rest_api_time_is_read_in_utc_with_its_milliseconds() -> None:
    assert timestamp("1970-01-01T00:00:01.250GMT") == 1.25
    later = timestamp("2026-11-29T07:36:51.123GMT") - timestamp("2026-11-29T07:36:50.000GMT")
    assert abs(later - 1.123) < 1e-6


def test_jobs_are_listed_in_submission_order_with_their_seconds_after_the_start() -> None:
    start = timestamp("2026-11-29T07:00:00.000GMT")
    jobs = [
        {
            "jobId": 1,
            "submissionTime": "2026-11-29T07:00:11.280GMT",
            "completionTime": "2026-11-29T07:00:13.090GMT",
            "stageIds": [1],
            "name": "parquet at Native.java:0",
        },
        {
            "jobId": 0,
            "submissionTime": "2026-11-29T07:00:02.820GMT",
            "completionTime": "2026-11-29T07:00:10.540GMT",
            "stageIds": [0],
            "name": "toArrow at _job_replay.py:306",
        },
        {
            "jobId": 2,
            "submissionTime": "2026-11-29T07:00:13.680GMT",
            "stageIds": [2],
            "name": "collect",
        },
    ]
    assert job_lines(jobs, start) == [
        "job   0    2.82 ->   10.54 ( 7.72 s) stages [0] toArrow at _job_replay.py:306",
        "job   1   11.28 ->   13.09 ( 1.81 s) stages [1] parquet at Native.java:0",
        "job   2   13.68 ->     not completed stages [2] collect",
    ]


def test_tasks_are_listed_by_launch_with_where_their_executor_says_their_seconds_went() -> None:
    start = timestamp("2026-11-29T07:00:00.000GMT")
    metrics = {
        "executorDeserializeTime": 1410,
        "executorRunTime": 12640,
        "executorCpuTime": 830_000_000,
        "jvmGcTime": 80,
        "resultSize": 8_700_000,
        "resultSerializationTime": 30,
    }
    tasks = [
        {
            "taskId": 5,
            "index": 1,
            "executorId": "1",
            "launchTime": "2026-11-29T07:00:03.770GMT",
            "duration": 14280,
            "gettingResultTime": 140,
            "schedulerDelay": 150,
            "taskMetrics": metrics,
        },
        {"taskId": 4, "index": 0, "executorId": "0", "launchTime": "2026-11-29T07:00:03.730GMT"},
    ]
    assert task_lines(0, tasks, start) == [
        "stage 0 task 0 executor 0: launched   3.73,  0.00 s: deserialise 0.00, run 0.00 "
        "(JVM CPU 0.00, GC 0.00), result 0.0 MB (serialise 0.00, fetch 0.00), scheduler 0.00",
        "stage 0 task 1 executor 1: launched   3.77, 14.28 s: deserialise 1.41, run 12.64 "
        "(JVM CPU 0.83, GC 0.08), result 8.7 MB (serialise 0.03, fetch 0.14), scheduler 0.15",
    ]
