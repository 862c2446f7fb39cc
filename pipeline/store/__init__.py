"""The data directory: files and atomic Parquet, views, de-duplication, compaction, GC, swaps."""
