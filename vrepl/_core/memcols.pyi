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

# -- line protocol (lineproto.pxi) ---------------------------------------------------------
UNIT_NS: int
UNIT_US: int
UNIT_MS: int
UNIT_S: int
UNIT_M: int
UNIT_H: int
UNIT_COUNT: int
SERIES_CACHE_MAX: int
TABLE_DIGEST_HEX: int

def convert_timestamp(v: int, unit: int, vunit: int) -> int | None: ...
def table_of_series(measurement: str, tags: Mapping[str, str] | Any) -> str: ...
def parse_series(key: bytes) -> tuple[str, tuple[tuple[str, bytes], ...]] | str: ...
def parse_lines(body: Any, schemas: Mapping[str, Mapping[str, str]] | None, limits: bool,
                ts_lo: int, ts_hi: int, max_rows: int, max_row_bytes: int,
                max_batch_bytes: int, max_columns: int, max_tables: int,
                table_count: int | None, unit: int, vunit: int, default_ts: int,
                max_line_bytes: int) -> tuple[Staged | None, str | None, int, int]: ...

# -- Arrow (arrowin.pxi) -------------------------------------------------------------------
ARROW_NULL: int
ARROW_BOOL: int
ARROW_INT: int
ARROW_UINT: int
ARROW_FLOAT: int
ARROW_STR: int
ARROW_DICT: int
ARROW_DECODE_MAX_ROWS: int

class ArrowColumn:
    name: str
    code: int
    width: int
    owidth: int
    unsigned_index: bool
    offset: int
    dict_offset: int
    dict_len: int
    validity: int
    data: int
    offsets: int
    dict_offsets: int
    dict_data: int
    keep: Any

def arrow_to_staged(batches: list[tuple[Any, ...]], schemas: Mapping[str, Mapping[str, str]] | None,
                    limits: bool, ts_lo: int, ts_hi: int, max_rows: int, max_row_bytes: int,
                    max_batch_bytes: int, max_columns: int, max_tables: int,
                    table_count: int | None, vunit: int) -> tuple[Staged | None, str | None]: ...
def ipc_scan(body: Any, max_messages: int
             ) -> tuple[str | None, bytes | None, list[tuple[int, int, int]] | None]: ...
def export_columns(batch: Any, layout: list[tuple[str, tuple[int, int, int, bool]]]
                   ) -> list[ArrowColumn]: ...
