"""Reading what ``loglake job cardinal-blocks`` wrote: its tables, and the canonical chain.

``table(spark, out_dir, name)`` is one of ``blocks``, ``chain_updates``, ``rejects`` (see
``jobs/cardinal_blocks.py`` for the columns), read only from micro-batches marked complete.
``canonical(spark, out_dir)`` is the chain as it stands after every reorg: the rows of
``blocks`` of each block that is on the chain now. The rule, over ``chain_updates`` in ``seq``
order: a block is on the chain if its last ``add`` comes after its last ``remove`` and after
every ``reorg`` whose ancestor number is below the block's number (a Reorg reverts everything
above its ancestor, also blocks older than the consumer's window, which its update cannot list).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from loglake.log.api import ascii_digits
from loglake.pipeline.jobs.cardinal_blocks import BATCHES, SCHEMAS, TABLES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["TABLES", "canonical", "canonical_chain", "committed_batches", "table"]


def committed_batches(out_dir: str | Path) -> list[int]:
    folder = Path(out_dir) / BATCHES
    if not folder.is_dir():
        return []
    return sorted(int(p.stem) for p in folder.glob("*.json") if ascii_digits(p.stem))


def table(spark: SparkSession, out_dir: str | Path, name: str) -> DataFrame:
    """One of the job's tables, from the micro-batches marked complete."""
    if name not in TABLES:
        raise ValueError(f"no table {name!r}; the job writes {', '.join(TABLES)}")
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(SCHEMAS[name])
    folder = Path(out_dir).resolve() / name
    paths = [
        str(p)
        for b in committed_batches(out_dir)
        if (p := folder / f"batch-{b:012d}.parquet").exists()
    ]
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*paths)


def canonical_chain(spark: SparkSession, out_dir: str | Path) -> DataFrame:
    """(number, hash, parent, weight) of every block on the chain now, by number."""
    from pyspark.sql import functions as F

    cu = table(spark, out_dir, "chain_updates")
    adds = (
        cu.where(F.col("action") == "add")
        .groupBy("hash")
        .agg(
            F.max("seq").alias("added"),
            F.first("number").alias("number"),
            F.first("parent").alias("parent"),
            F.first("weight").alias("weight"),
        )
    )
    removes = cu.where(F.col("action") == "remove").groupBy("hash").agg(F.max("seq").alias("rm"))
    reorgs = cu.where(F.col("action") == "reorg").select(
        F.col("seq").alias("rseq"), F.col("number").alias("ancestor")
    )
    live = adds.join(removes, "hash", "left").where(
        F.col("rm").isNull() | (F.col("added") > F.col("rm"))
    )
    reverted = live.join(
        reorgs, (reorgs.rseq > live.added) & (reorgs.ancestor < live.number), "left_semi"
    )
    on_chain = live.join(reverted.select("hash"), "hash", "left_anti")
    return on_chain.select("number", "hash", "parent", "weight").orderBy("number")


def canonical(spark: SparkSession, out_dir: str | Path) -> DataFrame:
    """The ``blocks`` rows of every block on the canonical chain (number order)."""
    chain = canonical_chain(spark, out_dir).select("hash")
    blocks = table(spark, out_dir, "blocks")
    return blocks.join(chain, "hash", "left_semi").orderBy("number", "key", "deleted")


def summary(out_dir: str | Path) -> dict:
    """Counts over the complete micro-batches (what the CLI prints)."""
    from loglake.pipeline.jobs.cardinal_blocks import summarize

    return json.loads(json.dumps(summarize(str(out_dir)).as_dict()))
