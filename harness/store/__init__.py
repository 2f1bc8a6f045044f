"""The store: the four tables as rows, the atomic Parquet writer, and DuckDB views to read them back."""
