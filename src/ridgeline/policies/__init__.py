"""Pure decision policies shared by the servers, the simulator and the tests."""
