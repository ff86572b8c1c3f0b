"""ernie-mtl: static-graph, fleet-distributed pretraining and multi-task fine-tuning of ERNIE."""
import zlib  # noqa: F401  (must be loaded before paddle: paddle 2.6.2 exports clashing zlib symbols)

__version__ = "0.1.0"
