"""Transactional load (docs/transactions.md): the per-vgroup transaction state machine and the
WAL records that drive it.

Owns: `record` (payload format 9: begin, rows, pre-commit, commit = publish, abort) and
`machine` (TxnTable: every transaction of one vgroup, its state, labels with retention, the
staged batches, the flush limit that keeps an open transaction's records in the WAL).
Must not: do I/O, read a clock or import anything above vrepl.errors / vrepl.replica: the
vnode applies records to it, the node decides what to forward, both outside this package.
"""

from vrepl.txn.machine import ABORTED, COMMITTED, PRECOMMITTED, PREPARE, STATES, VISIBLE, Outcome, Txn, TxnTable
from vrepl.txn.record import OPS, TXN_FORMAT, TxnRecord, decode_txn_payload, encode_txn_payload, is_txn_payload

__all__ = [
    "ABORTED",
    "COMMITTED",
    "OPS",
    "Outcome",
    "PRECOMMITTED",
    "PREPARE",
    "STATES",
    "TXN_FORMAT",
    "Txn",
    "TxnRecord",
    "TxnTable",
    "VISIBLE",
    "decode_txn_payload",
    "encode_txn_payload",
    "is_txn_payload",
]
