"""A job's durable state in object storage: the store, its lifecycle, leases, breakers,
the sweep and the fleet's share between keys."""
