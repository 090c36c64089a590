"""One Spark driver on the test cluster, kept for the whole session (``conftest.py``'s
``cluster_driver`` fixture), that runs each cluster test's job script in turn.

Why: this pytest process already holds the ``local[2]`` session (one SparkContext per JVM), so a
cluster job needs a driver in another process. Starting one per test cost each test a Python
start, a JVM, an application registration and executor launches on the worker (~10-15 s) before
the job itself ran; one driver pays that once. Each job still runs unchanged on the cluster's
executors, in the same session every local test shares too.

Protocol (one JSON object a line): the test sends ``{"script": ..., "argv": [...]}``; the
driver ``exec``s the script with ``spark``, ``master`` and ``argv`` in its namespace and answers
one line ``MARK`` + ``{"result": <the script's `result`>}`` or ``{"error": <traceback>}`` (the
mark tells its answers from anything else a library prints).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "LOGLAKE-CLUSTER-DRIVER "


def main() -> None:
    from loglake.pipeline import build_session

    master = sys.argv[1]
    spark = build_session(
        master=master,
        app_name="loglake-cluster-tests",
        conf={
            "spark.executor.memory": "1g",
            "spark.driver.memory": "1g",
            "spark.cores.max": "2",
            # the executors run with this driver's JVM options: the tests' JIT flag
            # (tests/conftest.py TEST_JVM_OPTS, inherited in SPARK_SUBMIT_OPTS)
            "spark.executor.extraJavaOptions": os.environ.get("SPARK_SUBMIT_OPTS", ""),
        },
    )
    print(MARK + json.dumps({"ready": spark.sparkContext.master}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            req = json.loads(line)
            scope = {"spark": spark, "master": master, "argv": req["argv"]}
            try:
                exec(compile(req["script"], "<cluster test script>", "exec"), scope)
                answer = {"result": scope.get("result")}
            except BaseException:
                answer = {"error": traceback.format_exc()}
            print(MARK + json.dumps(answer), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
