"""Sampling: the one LogitsPipeline every decoding method runs (pipeline.py) and its pluggable
watermark stage (watermark_stage.py). The stage functions themselves are in generation/sample/sampler.py."""

from generation.sample.pipeline import LogitsPipeline, SampleOutput, StepRows
from generation.sample.watermark_stage import KGWBiasStage, WatermarkStage

__all__ = ["KGWBiasStage", "LogitsPipeline", "SampleOutput", "StepRows", "WatermarkStage"]
