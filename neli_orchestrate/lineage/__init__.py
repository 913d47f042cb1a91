"""OpenLineage: the ``neli`` run facet (``facet.py``) and its schema (``NeliRunFacet.json``)."""
