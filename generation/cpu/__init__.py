"""The engine's CPU kernels: the C++ extension (csrc/, built by native.py) and the layers and linears that swap it into the model."""
