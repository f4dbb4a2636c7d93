"""Datasets: RLDS episodes in TFDS array_record datasets, written and read without TensorFlow."""

from jaxrl_mgpu.data.rlds import DatasetError, Histories, info, read, shard, verify, write

__all__ = ["DatasetError", "Histories", "info", "read", "shard", "verify", "write"]
