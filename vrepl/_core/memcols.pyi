from typing import Any, Mapping

import numpy as np

KIND_INT: int
KIND_FLOAT: int
KIND_BOOL: int
KIND_STR: int
KIND_OF_TYPE: dict[str, int]

class Column:
    name: str
    kind: int
    n: int
    def arrays(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]: ...
    def py_values(self, idx: np.ndarray, n: int) -> list[Any]: ...

class TableLog:
    n: int
    columns: dict[str, Column]
    increasing: bool
    def append_row(self, ts: int, version: int, epoch: int, values: dict[str, Any],
                   schema: Mapping[str, str] | None) -> None: ...
    def extend(self, src: TableLog, version: int, epoch: int) -> None: ...
    def split_at(self, pos: int) -> TableLog: ...
    def seal(self) -> None: ...
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

class Staged:
    tables: dict[str, TableLog]
    added: dict[str, dict[str, str]]
    rows: int
    nbytes: int
    def __len__(self) -> int: ...

def apply_rows(tables: dict[str, TableLog], rows: Any, version: int, epoch: int,
               schemas: Mapping[str, Mapping[str, str]] | None) -> int: ...

def parse_batch(body: Any, schemas: Mapping[str, Mapping[str, str]] | None, limits: bool,
                ts_lo: int, ts_hi: int, max_rows: int, max_row_bytes: int,
                max_batch_bytes: int, max_columns: int, max_tables: int,
                table_count: int | None) -> Staged | None: ...
