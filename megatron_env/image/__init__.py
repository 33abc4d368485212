"""Images from the lock: an OCI image layout and an enroot squashfs of a profile's environment,
written by the tool itself (no daemon), the same bytes from the same lock.

`tarlayer` writes one reproducible layer (streamed), `oci` the layout around the layers,
`base` reads or makes the base system and says whether the environment can run on it,
`envlayers` installs the lock's packages at the image's path and splits them by RECORD,
`squash` flattens the image into squashfs for enroot, `build` puts them together.
"""
