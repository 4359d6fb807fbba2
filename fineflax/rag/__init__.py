"""RAG variants as arms of the served loop: (retrieval strategy, generator, prompt).

spec.py        declaring variants, retrievers, categories and priors (JSON file or NAME:key=value flags)
retrievers.py  corpus engines (retrieval/), a /retrieve server URL, a memory/ store collection
agents.py      retrieve + the generator's messages (naive / hybrid / no RAG); the Search-R1 loop (agentic)
categories.py  the rule classifier that gives a request its category when it names none
The server (`fineflax.serve`) and the offline comparison (`fineflax.evals`) run them; the generator is theirs.
"""
