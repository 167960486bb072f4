"""The watermark scheme: specs, the keyed PRF, green lists, the logits processor, statistics, keys."""

from watermark.config import SpecError, WatermarkSpec

__all__ = ["SpecError", "WatermarkSpec"]
