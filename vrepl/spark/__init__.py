"""The PySpark validation job: do the replicas of a vgroup hold the same data?

Owns: `validate()` (validation.py) and its parts: driver-side reading and checks of replica
directories (inputs.py, checks.py), the Spark comparison of rows and epochs (job.py), the
quiet session (session.py), the report (report.py) and `vrepl validate` (cli.py); and
`read_vgroup()` (read.py), a vgroup's archived rows as a DataFrame; `write()`
(write.py), a DataFrame loaded into a vgroup in one transaction.
docs/validation.md. Must not: import pyspark at import time (vrepl works without the
`spark` extra until a validation runs), or write into a replica directory.
"""
import warnings

from vrepl.errors import InputError, SparkJobError
from vrepl.spark.model import Finding, ReplicaSpec
from vrepl.spark.read import read_vgroup
from vrepl.spark.report import CheckResult, Report
# The entry module validate.py (`python -m vrepl.spark.validate`) is imported first, and the
# name then bound to the function: `vrepl.spark.validate` is the function (the module stays
# reachable as sys.modules["vrepl.spark.validate"]; spark-submit uses vrepl/spark/submit.py).
import vrepl.spark.validate  # noqa: F401
from vrepl.spark.validation import validate
from vrepl.spark.write import write

# `python -m vrepl.spark.validate` (docs/validation.md) runs validate.py as __main__ after this
# package imported it, and runpy warns about exactly that on stderr. The run is correct
# (validate.py only calls cli's main); the warning would make a refusal two
# lines where every refusal is one (docs/operations.md §Exit codes). Only that warning.
warnings.filterwarnings("ignore", message=r"'vrepl\.spark\.validate' found in sys\.modules",
                        category=RuntimeWarning)

__all__ = ["CheckResult", "Finding", "InputError", "ReplicaSpec", "Report", "SparkJobError",
           "read_vgroup", "validate", "write"]
