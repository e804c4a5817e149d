# cmake -D folder=PATH -P fresh_folder.cmake: PATH exists and is empty afterwards.
file(REMOVE_RECURSE "${folder}")
file(MAKE_DIRECTORY "${folder}")
