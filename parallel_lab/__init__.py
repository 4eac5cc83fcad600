"""parallel-lab: model parallelism (tensor and pipeline) taught by running it for real.

Everything a rank executes lives in this package: functions sent to rank processes must be
importable, so notebooks import from here and keep only the narrative (see lessons/).
"""

__version__ = "0.1.0"
