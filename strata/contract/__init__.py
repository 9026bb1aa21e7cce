"""What every Strata service must agree on at run time, and nothing else.

- ``template``: the text every model reads and writes (generator, probe and reward-model inputs);
- ``directions``: the response directions the probe proposes and the generators follow (R1);
- ``tiers``: the tier numbers of the protobuf tier enum;
- ``checksums``: the policy and RM weight checksums and the versions named after them;
- ``identity``: how a request and a sample are spelled inside every service's Redis keys;
- ``models``: where a service finds its model when none is configured: a built zoo's manifest.

The model zoo (``strata_tools.zoo``) builds models offline and is *not* a run-time dependency: services
import this package, never the zoo, and never build a model.
"""
