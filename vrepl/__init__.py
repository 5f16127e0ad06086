"""vrepl: master-slave replication for time-series vnodes, in the style of TDengine 2.0."""
__version__ = "0.1.0"
