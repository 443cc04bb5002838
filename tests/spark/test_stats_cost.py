"""What keeps nsqtw-stats cheap (issue 29, item 7): local sizing, one pass, the plan's shape, few jobs.

The cost itself is measured by ``bench/spark_vs_duckdb.py`` (wall times are never asserted here);
these tests pin the structure that the measured figures depend on.
"""

from __future__ import annotations

import io

import pytest

from spark_data import channel, line, topic

pytestmark = pytest.mark.spark

T0 = 1_700_000_040


def test_local_settings_size_the_shuffles_and_sort_the_aggregate() -> None:
    """Shuffle partitions: two per core, one per 128 MiB of input, at most 200; the window aggregation
    is a sort aggregate (its input arrives sorted), not an object hash aggregate."""
    pytest.importorskip("pyspark")
    from nsqtw.spark.stats import SORT_AGGREGATE, local_settings, shuffle_partitions

    assert shuffle_partitions(1000, cores=2) == 4
    assert shuffle_partitions(769_000_000, cores=2) == 6
    assert shuffle_partitions(2_696_000_000, cores=2) == 21
    assert shuffle_partitions(10**13, cores=2) == 200
    conf = local_settings(769_000_000, cores=2)
    assert conf["spark.sql.shuffle.partitions"] == "6"
    assert conf["spark.sql.execution.useObjectHashAggregateExec"] == "false"
    assert SORT_AGGREGATE.items() <= conf.items()


def _snapshots(tmp_path):
    lines = []
    for node in ("a.example", "b.example"):
        for i in range(6):
            tps = [topic(f"t{n}", msgs=10 * i, nbytes=100 * i,
                         channels=[channel("c", msgs=10 * i, depth=i, pct={0.99: 5e6, 0.5: 1e6})]) for n in range(3)]
            lines.append(line(T0 + 10 * i, node, 4151, T0 - 100, tps))
    path = tmp_path / "nsqd-stats.2023-11-14_22.x_4151.jsonl"
    path.write_bytes(b"".join(lines))
    return tmp_path


def _operators(plan) -> list[str]:
    """The physical plan's operator names, root first (depth-first, first child first)."""
    out, stack = [], [plan]
    while stack:
        node = stack.pop()
        out.append(node.nodeName())
        children = node.children()
        stack.extend(children.apply(i) for i in reversed(range(children.size())))
    return out


def test_two_shuffles_and_the_node_window_before_the_explode(spark, tmp_path) -> None:
    """The whole per-window table is one scan and two shuffles: the snapshots by node (the node's
    previous snapshot is found by sorting snapshots, not every topic row exploded from them), then the
    topic rows by (node, topic), which the per-series window and the aggregation share (spread over
    every partition, not one task per node)."""
    from nsqtw.spark.stats import compute_stats, read_snapshots

    df = compute_stats(read_snapshots(spark, [str(_snapshots(tmp_path))]))
    plan = df._jdf.queryExecution().executedPlan()
    if plan.nodeName() == "AdaptiveSparkPlan":
        plan = plan.executedPlan()
    ops = _operators(plan)
    assert ops.count("Exchange") == 2
    # one scan, Spark's JSON reader parsing each line once (from_json over text lines under a filter on
    # what it parsed was copied into the filter by the optimizer: every line parsed twice)
    assert [op.strip() for op in ops if "Scan" in op] in (["Scan json"], ["FileScan json"]), ops
    assert "from_json" not in df._jdf.queryExecution().executedPlan().toString()
    windows = [i for i, op in enumerate(ops) if op == "Window"]
    generates = [i for i, op in enumerate(ops) if op == "Generate"]
    assert len(windows) == 2
    # root first: the deepest Window (the node's) has no Generate below it
    assert all(g < windows[-1] for g in generates), ops
    assert df.count() > 0


@pytest.mark.parametrize("sort_aggregate", [False, True])
def test_the_output_columns_are_computed_by_the_window_aggregate(spark, tmp_path, sort_aggregate) -> None:
    """Every output column is an expression of the window aggregate, evaluated in its own result
    projection: no whole-stage Project after it (that generated stage, holding the e2e map's lambdas,
    was the job's costliest code to JIT-compile), and the e2e map takes each quantile's greatest value
    with a filter over the window's entries, not by sorting them (an interpreted struct ordering).  With the job's local settings (SORT_AGGREGATE) the
    aggregate is a sort aggregate, with Spark's defaults an object hash aggregate: the same rows."""
    from nsqtw.spark.stats import SORT_AGGREGATE, compute_stats, read_snapshots

    (key, value), = SORT_AGGREGATE.items()
    before = spark.conf.get(key)
    if sort_aggregate:
        spark.conf.set(key, value)
    try:
        df = compute_stats(read_snapshots(spark, [str(_snapshots(tmp_path))]))
        rows = df.collect()
        plan = df._jdf.queryExecution().executedPlan()
    finally:
        spark.conf.set(key, before)
    if plan.nodeName() == "AdaptiveSparkPlan":
        plan = plan.executedPlan()
    while plan.nodeName().endswith("QueryStage"):  # adaptive execution's final stage
        plan = plan.plan()
    ops = [op for op in _operators(plan) if not op.startswith(("WholeStageCodegen", "InputAdapter"))]
    assert ops[0] == ("SortAggregate" if sort_aggregate else "ObjectHashAggregate"), ops
    assert len(rows) == 12
    text = plan.resultExpressions().toString()  # the plan's own string is cut short
    assert "e2e_ms" in text and "sort_array(" not in text and "filter(" in text, text
    r = df.where("channel = 'c'").orderBy("node", "window_start").first()
    assert r["e2e_ms"] == {"0.99": 5.0, "0.5": 1.0}


def test_the_summary_and_the_marks_sort_without_sampling_the_result(spark, tmp_path) -> None:
    """The summary (and the report's marks) are sorted without a global orderBy: its range partitioning
    samples its input first, a second pass over the whole cached result (1.7 CPU-s on 2.7 GB)."""
    from nsqtw.spark.stats import chart_marks, compute_stats, read_snapshots, summarize

    result = compute_stats(read_snapshots(spark, [str(_snapshots(tmp_path))])).cache()
    try:
        result.count()
        summary = summarize(result)
        rows = summary.collect()
        keys = [(r["topic"], r["channel"] is not None, r["channel"] or "", r["node"]) for r in rows]
        assert len(rows) == 12 and keys == sorted(keys)
        plan = summary._jdf.queryExecution().executedPlan().toString()
        assert "rangepartitioning" not in plan, plan
        assert chart_marks(result)["restarts"] == sorted(chart_marks(result)["restarts"], key=lambda m: (m[1], m[0]))
    finally:
        result.unpersist()


def test_the_report_collects_its_series_and_marks_in_one_query(spark, tmp_path) -> None:
    """--html's chart data: the chosen series' windows and the nodes' marks in one query over the cached
    result (one plan, one job), the same as chart_series' and chart_marks'."""
    from nsqtw.spark.stats import chart_data, chart_marks, chart_series, compute_stats, read_snapshots, summarize

    result = compute_stats(read_snapshots(spark, [str(_snapshots(tmp_path))])).cache()
    try:
        rows = summarize(result).collect()
        store = spark._jsparkSession.sharedState().statusStore()
        before = store.executionsCount()
        series, marks = chart_data(result, 2, rows)
        assert store.executionsCount() - before == 1
        assert series == chart_series(result, 2, rows) and marks == chart_marks(result)
        assert series["publish_rate"] and all(series["publish_rate"].values())
    finally:
        result.unpersist()


def test_html_adds_two_small_queries_over_the_cached_table(spark, tmp_path) -> None:
    """--html collects the chosen series' windows and the marks from the cached result: two more
    small queries (six jobs with adaptive execution's stages), not a pass over the input per chart
    (it was 13 jobs of 200 tasks each)."""
    from nsqtw.spark.stats import build_parser, run

    data = _snapshots(tmp_path)
    sc = spark.sparkContext
    tracker = sc.statusTracker()

    def jobs(extra: list[str], group: str) -> int:
        sc.setJobGroup(group, group)
        try:
            run(build_parser().parse_args([str(data), "-o", "", *extra]), spark=spark, out=io.StringIO(),
                err=io.StringIO())
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        return len(tracker.getJobIdsForGroup(group))

    plain = jobs([], "cost-plain")
    html = jobs(["--html", str(tmp_path / "r.html")], "cost-html")
    assert plain >= 1 and html - plain <= 6, (plain, html)


def test_local_launch_settings_respect_spark_defaults(tmp_path, monkeypatch) -> None:
    """The driver heap of local_settings goes to a JVM this process launches for a local master, unless
    spark-defaults.conf sets it; never under spark-submit or for a cluster master from the defaults."""
    pytest.importorskip("pyspark")
    from nsqtw.spark import session

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("MASTER", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session._defaults_file() == {} and session._launches_local(None) and session._launches_local("local[2]")
    (tmp_path / "spark-defaults.conf").write_text("# mine\nspark.master  spark://10.0.0.5:7077\n"
                                                  "spark.driver.memory=700m\n")
    assert session._defaults_file() == {"spark.master": "spark://10.0.0.5:7077", "spark.driver.memory": "700m"}
    assert not session._launches_local(None) and session._launches_local("local[1]")
    assert not session._launches_local("yarn")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert not session._launches_local("local[1]")


def test_the_job_jvm_gets_the_local_heap(tmp_path) -> None:
    """A local job's JVM starts with local_settings' heap (Spark's default is 1g) and JIT options,
    beside the quiet log4j file's."""
    import os
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("pyspark")
    script = textwrap.dedent("""
        from nsqtw.spark.session import get_session
        from nsqtw.spark.stats import LOCAL_JIT_OPTIONS
        s = get_session("heap", "local[1]", {"spark.ui.enabled": "false"}, verbose=False,
                        local_conf={"spark.driver.memory": "1536m", "spark.driver.extraJavaOptions": LOCAL_JIT_OPTIONS})
        args = list(s.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
        print(all(o in args for o in LOCAL_JIT_OPTIONS.split()), any(a.startswith("-Dlog4j2.configurationFile=") for a in args),
              s.sparkContext.getConf().get("spark.driver.memory"),
              s.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20)
        s.stop()
    """)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(tmp_path))
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("MASTER", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    jit, quiet, setting, heap_mib = out.stdout.split()[-4:]
    assert setting == "1536m" and int(heap_mib) > 1100, out.stderr[-2000:]
    assert jit == "True" and quiet == "True", out.stdout


def test_fields_the_job_does_not_read_reject_nothing(spark, tmp_path) -> None:
    """The parser converts only the fields the job reads: a client list, memory figures or a ``paused``
    of another type do not reject the line; a wrong type in a field it reads still rejects it whole; a
    line with only white space (a CR) is blank, not malformed, in the job's pass and the rejected list."""
    from nsqtw.spark.stats import read_snapshot_lines, read_snapshot_records

    good = line(T0, "a.example", 4151, T0 - 100, [topic("t", msgs=1)])
    odd = good.replace(b'"topics":[', b'"health":17,"memory":[1,"x"],"topics":[').replace(b'"paused":false', b'"paused":"no"')
    assert odd != good
    wrong = good.replace(b'"message_count":1', b'"message_count":"1"')
    path = tmp_path / "nsqd-stats.2023-11-14_22.x_4151.jsonl"
    path.write_bytes(good + odd + b"\r\n \n" + wrong)
    records = read_snapshot_records(spark, [str(tmp_path)]).select("timestamp", "_bad").collect()
    assert [r["_bad"] is None for r in records] == [True, True, False]
    lines = read_snapshot_lines(spark, [str(tmp_path)]).select("_bad").collect()
    assert [r["_bad"] for r in lines] == [r["_bad"] for r in records]


def test_the_written_rows_are_counted_as_the_cache_fills_and_the_table_is_one_partition_per_core(
        spark, tmp_path, monkeypatch) -> None:
    """On a local master the table is coalesced to one partition per core (the output: at most that many
    files per date, not one per shuffle partition), and the rows written are counted by an observation
    while the cache fills, not by a count of their own (a job over the cached table)."""
    from nsqtw.spark.stats import build_parser, run

    data = _snapshots(tmp_path)
    out = tmp_path / "out"
    frame = type(spark.range(1))

    def no_count(self):
        raise AssertionError("count() called")

    monkeypatch.setattr(frame, "count", no_count)
    res = run(build_parser().parse_args([str(data), "-o", str(out)]), spark=spark, out=io.StringIO(),
              err=io.StringIO())
    monkeypatch.undo()
    assert res["rows_written"] == spark.read.parquet(str(out)).count() == 12
    files = list(out.rglob("part-*"))
    assert 1 <= len(files) <= spark.sparkContext.defaultParallelism, files


def test_the_e2e_map_holds_each_quantiles_worst_value_in_first_seen_order(spark, tmp_path) -> None:
    """e2e_ms: per quantile the greatest value reported in the window (a quantile missing from some
    snapshots, or one that first appears later, included), keys in the order they first appear; a
    window whose snapshots report no percentiles has none."""
    from nsqtw.spark.stats import compute_stats, read_snapshots

    pcts = [{0.99: 5e6, 0.5: 1e6}, {0.5: 3e6, 0.999: 9e6}, {0.99: 7e6}, {0.5: 2e6, 0.99: 6e6}, None, None]
    lines = [line(T0 + 10 * i, "a.example", 4151, T0 - 100,
                  [topic("t", msgs=10 * i, channels=[channel("c", msgs=10 * i, pct=p)])]) for i, p in enumerate(pcts)]
    lines += [line(T0 + 60 + 10 * i, "a.example", 4151, T0 - 100,
                   [topic("t", msgs=100 + i, channels=[channel("c", msgs=100 + i)])]) for i in range(2)]
    (tmp_path / "nsqd-stats.2023-11-14_22.a_4151.jsonl").write_bytes(b"".join(lines))
    table = compute_stats(read_snapshots(spark, [str(tmp_path)])).where("channel = 'c'")
    # the map's own order (a collected map becomes a Python dict by way of a Java hash map)
    got = {r["window_start"].timestamp(): r["e2e"]
           for r in table.selectExpr("window_start", "arrays_zip(map_keys(e2e_ms), map_values(e2e_ms)) AS e2e").collect()}
    assert [tuple(e) for e in got[T0]] == [("0.99", 7.0), ("0.5", 3.0), ("0.999", 9.0)]
    assert got[T0 + 60] is None


def test_the_columns_replaced_together_are_one_projection_each(spark, tmp_path) -> None:
    """The previous values a new series starts from, and the summary's two rates, are set by one
    withColumns each, not one withColumn per column: each withColumn is a projection the driver
    analyzes before the first task (18 and 19 projections in the analyzed plans, 24 and 26 before;
    0.25 s of the job's start-up on 2.7 GB)."""
    from pyspark.sql import functions as F

    from nsqtw.spark.stats import compute_stats, read_snapshot_records, summarize

    records = read_snapshot_records(spark, [str(_snapshots(tmp_path))], None)
    table = compute_stats(records.where(F.col("_bad").isNull()))
    summary = summarize(table)

    def projections(df) -> int:
        return df._jdf.queryExecution().analyzed().toString().count("Project [")

    assert projections(table) <= 18 and projections(summary) <= 19, (projections(table), projections(summary))
