from typing import Any, Mapping

def fast_check(rows: Any, schemas: Mapping[str, Mapping[str, str]] | None, limits: bool,
               ts_lo: int, ts_hi: int, max_rows: int, max_row_bytes: int,
               max_batch_bytes: int, max_columns: int, max_tables: int,
               table_count: int | None) -> tuple[dict[str, dict[str, str]], int] | None: ...
