"""
nsqtw's Spark pipeline (the ``nsqtw[spark]`` extra: pyspark, pyarrow).

* :mod:`nsqtw.spark.stats` -- ``nsqtw-stats``: rates, depths and latencies per
  node, topic, channel and time window from ``--stats-export-path`` snapshots.
* :mod:`nsqtw.spark.replay` -- ``nsqtw-replay``: de-duplicate ``nsq_to_file``
  archives and republish them (or write a clean archive).
* :mod:`nsqtw.spark.source` -- ``spark.readStream.format("nsq")``: a Structured
  Streaming source with a durable spool, so offsets are replayable.

Every job is plain PySpark: ``local[*]`` by default, any cluster with ``--master``.
Nothing here imports pyspark at module import time except the modules that are
Spark jobs themselves.
"""
