"""The store: the four tables as rows, the claim on a run id, the atomic Parquet writer, and DuckDB views to read them back."""
