"""The model-server simulator (installed as ``epp_sim``)."""
