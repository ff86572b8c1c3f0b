"""Data tools: raw text -> tokenized, memory-mapped `.bin/.idx` datasets, and the compiled
index helper that turns them into training samples. See data_tools/README.md."""
import zlib  # noqa: F401  (must be loaded before paddle: paddle 2.6.2 exports clashing zlib symbols)
