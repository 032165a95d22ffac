// `cleave attack`: the attacks an honest-but-curious server runs on what it recorded of a
// run (split.record, split/record.h), as an operator measures a cut's and a defense's
// leakage (docs/security.md).
#pragma once

#include <ostream>
#include <string>

namespace cleave {

// `cleave attack tokens RUN_DIR`: token recovery at a decoder's embedding cut
// (RecoverTokensAtTheEmbedding) over every recorded task of the run, one line per task
// and a total ("recovered R of N tokens (P %)"). 0 when some record was attacked; 2 with
// the reason when none could be (no records, records of another cut or mode).
int RunTokenAttack(const std::string& run_dir, std::ostream& out, std::ostream& err);

}  // namespace cleave
