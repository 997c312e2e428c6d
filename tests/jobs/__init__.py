"""Jobs the tests start: the toy job's config and roles, roles that misbehave on purpose, small programs."""
