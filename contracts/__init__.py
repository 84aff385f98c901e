"""One implementation of each contract the deployables share.

Pod annotations, the simulated cluster file and the JSON log format are read and
written here and nowhere else; the extender, the agent, the inference server,
the simulator and the demo all import these modules. Nothing here imports
another tandem package.
"""
