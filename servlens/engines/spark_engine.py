"""Spark: `spark:local[N]` (in this process's JVM), `spark://HOST:PORT` (a standalone cluster), `sc://HOST:PORT`
(Spark Connect). The canonical tables are session temp views (over a Parquet export, or a catalog table by name);
every result comes back through Arrow, so timestamps and NULLs arrive as the other engines give them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from servlens.engines.base import Engine, empty_lists_as_null
from servlens.engines.functions import translate
from servlens.engines.schema import empty_relation_sql
from servlens.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

# UTC like every servlens time; the UI off and the driver on loopback (servers bind to 127.0.0.1 only); few
# shuffle partitions: servlens' aggregates are small, Spark's default of 200 only adds scheduling time.
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}
LOCAL_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
# The driver JVM this process starts itself (spark:local, and the client-mode driver of a standalone cluster) ran out
# of its default 1 GB on every built-in rule over four runs: local runs the whole job in it, and a cluster's driver
# still plans every query and keeps their results. Spark's exact percentile keeps every distinct value of a group in
# memory, so local mode at 10M requests ran out of 2 GB on the per-model quantiles (Java heap space): a quarter of
# the RAM, between 2 and 8 GB, unless SPARK_DRIVER_MEMORY says otherwise. Only before the JVM starts, so not for sc://.
DRIVER_MEMORY_ENV = "SPARK_DRIVER_MEMORY"


def driver_conf() -> dict[str, str]:
    """The driver's memory: SPARK_DRIVER_MEMORY when set (Spark's own variable), else RAM / 4 within 2-8 GB."""
    wanted = os.environ.get(DRIVER_MEMORY_ENV, "").strip()
    if wanted:
        # a size the JVM takes (-Xmx): a bad one made Java exit and the error blamed Java or the URL
        if not re.fullmatch(r"\d+[kmgt]?", wanted, re.IGNORECASE):
            raise ConfigError(f"{DRIVER_MEMORY_ENV}={wanted!r} is not a memory size",
                              "Set it like 8g or 4096m, or unset it for a quarter of the RAM")
        return {"spark.driver.memory": wanted}
    from servlens.store.schema import physical_memory_bytes

    total = physical_memory_bytes() or 0
    return {"spark.driver.memory": f"{max(2, min(8, total // 4 // (1 << 30)))}g"}


class SparkEngine(Engine):
    name = "spark"

    def __init__(self, url: str, conf: dict[str, str] | None = None, **kwargs):
        super().__init__(url, **kwargs)
        try:
            from pyspark.sql import SparkSession
        except ImportError:
            raise ConfigError("--engine spark needs pyspark (and Java 17+)", "pip install 'servlens[engines]'") from None
        settings = SESSION_CONF | (conf or {})
        builder = SparkSession.builder.appName("servlens")
        if url.startswith("sc://"):
            builder = builder.remote(url)
        else:
            master = url[len("spark:"):] if url.startswith("spark:local") else url
            builder = builder.master(master)
            settings = LOCAL_CONF | driver_conf() | settings
        for key, value in settings.items():
            builder = builder.config(key, value)
        try:
            self.spark = builder.getOrCreate()
        except Exception as exc:  # noqa: BLE001 (no Java, master unreachable, Connect server down)
            raise ConfigError(f"Cannot start a Spark session on {url}: {str(exc).splitlines()[0][:200]}",
                              "Check that Java 17+ is installed and the master or Connect URL is reachable") from None
        self._persisted: dict = {}  # materialise(): view name -> its checkpointed DataFrame
        if not url.startswith("sc://"):
            self.spark.sparkContext.setLogLevel("OFF")  # a refused query is one sentence from servlens, not a log
        # pyspark logs every refused query again, as a JSON record with the JVM's stack trace, from Python
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)

    def _bind_parquet(self, table: str, dirs: list[Path]) -> None:
        if dirs:
            # recursiveFileLookup: the run=/day= folders only prune; run is a column of the files themselves.
            frame = self.spark.read.option("recursiveFileLookup", "true").parquet(*(str(d) for d in dirs))
        else:
            frame = self.spark.sql(translate(empty_relation_sql(table), "spark"))
        frame.createOrReplaceTempView(table)
        self.tables[table] = table

    def materialise(self, name: str, sql: str, views: dict[str, str] | None = None) -> str | None:
        """A view read by many queries of a scope as a checkpointed DataFrame under a session temp view: Spark plans a
        temp view again at every reference and recomputed each scope view per rule query (a parity run over four
        small runs took 25 min). Checkpointed, not persisted: a persisted view read inside a CTE (every rule query
        reads its views as CTEs) missed Spark's cache and was computed again (SL010 at 1M: 14.5 s against 0.5 s for
        a count of its concurrency view); a checkpoint cuts the plan, so every reference reads the stored rows. The
        previous scope's rows of that name are released; the rows stay on Spark."""
        from pyspark import StorageLevel

        native = self._computed_native(sql, views)
        self._computed.clear()  # a probe reading this view by name read the previous scope's rows
        try:
            frame = self.spark.sql(native).localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
        except Exception:  # noqa: BLE001 (then a CTE, whose own error, if it has one, is the one the query reports)
            return None
        view = f"servlens_scratch_{name}"
        frame.createOrReplaceTempView(view)
        _release(self._persisted.pop(name, None))
        self._persisted[name] = frame
        return f"SELECT * FROM {view}"

    def _fetch_arrow(self, native_sql: str, limit: int) -> pa.Table:
        # collect_list over no row is [] where DuckDB's list() is NULL (rule SL010's levels list)
        return empty_lists_as_null(self.spark.sql(native_sql).limit(limit).toArrow())

    def execute(self, native_sql: str) -> None:
        self.spark.sql(native_sql)

    def _columns_of_empty(self, table: str) -> list[str]:
        return list(self.spark.table(self.tables[table]).columns)

    def version(self) -> str:
        return self.spark.version

    def functions(self) -> set[str]:
        return {row[0].lower() for row in self.spark.sql("SHOW FUNCTIONS").collect()}

    def close(self) -> None:
        self.spark.stop()


def _release(frame) -> None:
    """Free a checkpointed DataFrame's stored rows now rather than at the JVM's next garbage collection (a scope's
    requests, each scope in turn). On Spark Connect the server frees them with the DataFrame."""
    if frame is None or not hasattr(frame, "_jdf"):
        return
    try:
        frame._jdf.queryExecution().logical().rdd().unpersist(False)
    except Exception:  # noqa: BLE001 (a plan that is not the checkpoint's LogicalRDD: left to the JVM's cleaner)
        pass
