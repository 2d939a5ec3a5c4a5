"""The engine's model gateway: one per attempt, holding the key, metering and capping every model call
(engine/model_gateway/server.py), reading usage from the wire (usage.py), pricing it from a versioned
table (prices.py, prices.json) and checking the budgets before a call leaves (meter.py). No Django imports."""
from . import conversation, meter
from .meter import IdleWatch, LoopWatch, Meter, Spent, caps_of, spend_of
from .server import ModelGateway, UpstreamError

__all__ = ["conversation", "meter", "IdleWatch", "LoopWatch", "Meter", "ModelGateway", "Spent", "UpstreamError", "caps_of", "spend_of"]
