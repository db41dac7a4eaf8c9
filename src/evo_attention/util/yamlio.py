"""Reading YAML that the user wrote: a key given twice in one mapping is an error naming both lines
(plain YAML silently keeps the last), used for config files and suite files alike."""

from __future__ import annotations


class DuplicateKey(Exception):
    """A key given twice in one mapping: the key and the lines of both."""

    def __init__(self, key, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def unique_key_loader():
    """A safe YAML loader that refuses a key given twice in one mapping (``DuplicateKey``)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise DuplicateKey(key, seen[key], key_node.start_mark.line + 1)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: the default constructor names it
                pass
        return loader.construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return UniqueKeyLoader
