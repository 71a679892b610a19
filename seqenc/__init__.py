"""seqenc's model core: the TVM-KA encoder and the table / text encoders built on its layers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("seqenc")
except PackageNotFoundError:  # a source checkout on PYTHONPATH, not installed
    __version__ = "0+unknown"
