"""The timeline profiler and bottleneck analyzer.

``with tl.profile() as prof:`` records every plan call; ``prof.table()``,
``prof.export_chrome_trace(path)``, ``prof.bottlenecks()``, ``prof.plot_timeline(path)`` and
``prof.plot_roofline(path)`` present the recording. ``tl.calibrate()`` measures the peaks the
analyzer sets steps against.
"""

from .bottleneck import Advice, BottleneckReport, StepStats, ThreadInfo, roofline
from .calibration import Peaks, calibrate
from .events import CallEvent, CounterSample, HostEvent, StepEvent, Track
from .timeline import Profile, profile

__all__ = [
    "Advice",
    "BottleneckReport",
    "CallEvent",
    "CounterSample",
    "HostEvent",
    "Peaks",
    "Profile",
    "StepEvent",
    "StepStats",
    "ThreadInfo",
    "Track",
    "calibrate",
    "profile",
    "roofline",
]
