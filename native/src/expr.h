// Integer expressions over the runtime values of symbolic dimensions (postfix form).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace cuvil {

// Raised when an expression cannot be evaluated (division by zero, int64 overflow).
struct EvalError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Expr {
public:
    enum class Op : uint8_t { Const, Sym, Add, Sub, Mul, FloorDiv, Mod, Max, Min };
    struct Token {
        Op op;
        int64_t value;  // the constant, or the symbol index
    };

    Expr() : folded_(0) {}
    static Expr constant(int64_t v);
    // Checks the stack discipline and symbol indices; folds a symbol-free expression.
    // Returns an error message, or an empty string when the code is well formed.
    static std::string build(std::vector<Token> code, int n_symbols, Expr& out);

    bool is_constant() const { return folded_.has_value(); }
    int64_t value() const { return *folded_; }  // only when is_constant()
    int64_t eval(const int64_t* symbols) const;  // throws EvalError

private:
    std::vector<Token> code_;
    std::optional<int64_t> folded_;
};

// Python semantics: floor division and a modulo with the divisor's sign (sympy's floor / Mod).
int64_t floor_div(int64_t a, int64_t b);
int64_t floor_mod(int64_t a, int64_t b);

}  // namespace cuvil
