"""Sampling: the one LogitsPipeline every decoding method runs (pipeline.py) and its pluggable
watermark stage (stage.py declares its hooks; watermark_stage.py picks a watermark's). The stage functions
themselves are in generation/sample/sampler.py."""

from generation.sample.pipeline import LogitsPipeline, SampleOutput, StepRows
from generation.sample.stage import WatermarkStage
from generation.sample.watermark_stage import KGWBiasStage

__all__ = ["KGWBiasStage", "LogitsPipeline", "SampleOutput", "StepRows", "WatermarkStage"]
