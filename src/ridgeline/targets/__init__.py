"""Target adapters: one inference endpoint each, behind the three-method ``Target`` Protocol.

``make_target(url, options)`` picks the adapter from the URL (``describe_target_urls()`` lists
the forms); the adapter classes can also be built directly.
"""

from ridgeline.targets.base import OK, Reply, Target
from ridgeline.targets.factory import describe_target_urls, make_target
from ridgeline.targets.http import HttpTarget
from ridgeline.targets.inprocess import InProcessTarget, null_target
from ridgeline.targets.openai import OpenAITarget
from ridgeline.targets.options import TargetOptions
from ridgeline.targets.v2_grpc import V2GrpcTarget
from ridgeline.targets.v2_http import V2HttpTarget
from ridgeline.v2.spec import TensorSpec

__all__ = [
    "OK",
    "HttpTarget",
    "InProcessTarget",
    "OpenAITarget",
    "Reply",
    "Target",
    "TargetOptions",
    "TensorSpec",
    "V2GrpcTarget",
    "V2HttpTarget",
    "describe_target_urls",
    "make_target",
    "null_target",
]
