"""The ``EndpointPickerConfig``: schema, two-phase loader, YAML with line numbers, reload, feature gates, units."""
