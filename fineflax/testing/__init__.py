"""Helpers shared by tests/ and benchmarks/ (neither imports the other): tiny random models written by
transformers (`hf_models`), a served tiny chat model (`serve`), hostile programs for the code sandbox
(`sandbox_hostile`) and a slowed search engine (`retrieval`). The library itself never imports them."""
