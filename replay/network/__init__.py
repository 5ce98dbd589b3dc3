"""Network model of simulated replay: topologies and collective cost formulas."""
