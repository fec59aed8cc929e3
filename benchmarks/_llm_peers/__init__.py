"""GuideLLM and AIPerf beside ridgeline (``benchmarks/llm.py``): the peers' venvs
(``setup.sh``), GPT-2's tokenizer built offline (``tokenizer_dir.py``), each tool's
command (``tools.py``) and output (``parsers.py``), and what the cores did (``host.py``)."""
