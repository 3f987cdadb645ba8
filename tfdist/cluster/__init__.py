"""Cluster specs: addresses, free ports, TF_CONFIG and the Kubeflow TFJob manifest."""
