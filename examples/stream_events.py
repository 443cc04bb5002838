import os
import sys

from pyspark.sql import SparkSession

from nsqtw.spark.source import await_termination, register

nsqd, base = sys.argv[1], sys.argv[2]    # e.g. "10.0.0.1:4150,10.0.0.2:4150" and /data/events
# Spark's Python workers run this interpreter unless spark.pyspark.python (or PYSPARK_PYTHON) names
# another one, which needs pyspark and pyarrow, not nsqtw: register() ships the source with the query
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# no .master(): spark-submit's --master (or spark-defaults.conf) decides, local[*] when run directly
spark = SparkSession.builder.appName("nsq-events").getOrCreate()
register(spark)  # checks that Spark's Python workers can run the source, and says how to fix it if not
events = (spark.readStream.format("nsq")
          .option("nsqd", nsqd)                    # or .option("lookupd", "10.0.0.9:4161")
          .option("topic", "events").option("channel", "spark")
          .option("spoolDir", os.path.join(base, "checkpoint", "nsq-spool"))
          .load())                 # columns: id, timestamp, attempts, body, topic, channel
query = (events.writeStream.format("parquet").option("path", os.path.join(base, "parquet"))
         .option("checkpointLocation", os.path.join(base, "checkpoint")).start())
await_termination(query)  # query.awaitTermination(), naming the cause if the source process dies
