"""Operations: `tandem status`, its rendering, and Prometheus metrics."""
