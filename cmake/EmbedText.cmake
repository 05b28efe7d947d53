# cmake -DINPUT=<file> -DOUTPUT=<header> -DNAME=<identifier> -P EmbedText.cmake
# Writes a header defining `inline constexpr char NAME[]` with the file's text, as a raw string
# literal (the text must not contain the delimiter `)TANDEM_EMBED"`).
file(READ "${INPUT}" text)
string(FIND "${text}" ")TANDEM_EMBED\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )TANDEM_EMBED\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/EmbedText.cmake: do not edit.\n#pragma once\n"
  "inline constexpr char ${NAME}[] = R\"TANDEM_EMBED(${text})TANDEM_EMBED\";\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
