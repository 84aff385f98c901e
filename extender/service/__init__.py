"""The extender's service layer, between the transport and the decision core.

- :mod:`extender.service.verbs`: ``Extender``, the four scheduler verbs (filter,
  prioritize, bind, preempt);
- :mod:`extender.service.demand_cache`: each pod's resolved demand, kept between
  filter and bind, and the predictor seam (``DemandPredictor``);
- :mod:`extender.service.bind_outcomes`: refused binds and binds with no answer;
- :mod:`extender.service.agents`: agent reports and ``/v1/state`` reads.
"""
