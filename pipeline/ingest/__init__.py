"""Sealed spool segments and dump files -> spans Parquet; the converter child processes."""
