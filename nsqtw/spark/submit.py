"""The file to give ``spark-submit``: ``spark-submit [spark options] <this file> {stats,replay} [options]``.

``spark-submit`` runs a file as a script, where the package's relative imports fail; this one imports
nsqtw absolutely (nsqtw must be installed in the driver's Python: ``spark.pyspark.driver.python``).
Its path: ``python -m nsqtw.spark submit-file``.  The master is spark-submit's unless the job's own
``--master`` is given.
"""

import os
import sys

if __name__ == "__main__":
    # run as a script, this directory is sys.path[0]: its modules (stats, cli...) must not shadow others
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    from nsqtw.spark.__main__ import main

    sys.exit(main())
