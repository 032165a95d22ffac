// Internal to data/: what GPT-2's BPE (data/gpt2_bpe.h) and Hugging Face's tokenizers
// (data/hf_tokenizer.h) share: the byte-level symbols, the UTF-8 steps and the merges.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cleave {

// GPT-2's byte-to-symbol map: printable bytes stand for themselves, the other 68 for
// code points 256 and up, so that every byte is a visible character in a vocabulary.
const std::vector<uint32_t>& ByteToCodePoint();
// The byte a symbol stands for; -1 for a code point that stands for none.
int ByteOfCodePoint(uint32_t cp);

// Appends `cp` as UTF-8.
void AppendUtf8(uint32_t cp, std::string& out);
// Decodes the UTF-8 character at s[i] (advancing i); a malformed byte is returned as
// itself, one byte long.
uint32_t NextCodePoint(const std::string& s, size_t& i);

// BPE's merges (GPT-2's bpe()): while some adjacent pair of `parts` has a rank, merge
// every occurrence of the lowest-ranked pair, left to right. `rank`: the pair's rank, or
// -1 for a pair that does not merge.
std::vector<std::string> MergeByRank(std::vector<std::string> parts,
                                     const std::function<int(const std::string&, const std::string&)>& rank);

}  // namespace cleave
