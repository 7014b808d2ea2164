"""Per op: host launcher, autograd and custom-op registration, public function, OpSpec."""
