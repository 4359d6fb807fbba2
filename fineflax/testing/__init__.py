"""Helpers shared by tests/ and benchmarks/ (neither imports the other): tiny random models written by
transformers (`hf_models`), a served tiny chat model (`serve`), hostile programs for the code sandbox
(`sandbox_hostile`), a slowed search engine (`retrieval`) and scripts run on forced CPU devices
(`devices`). The library itself never imports them."""
