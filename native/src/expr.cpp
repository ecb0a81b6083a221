#include "expr.h"

#include <algorithm>

namespace cuvil {

int64_t floor_div(int64_t a, int64_t b) {
    if (b == 0) throw EvalError("division by zero");
    if (a == INT64_MIN && b == -1) throw EvalError("int64 overflow");
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
    if (b == 0) throw EvalError("modulo by zero");
    if (b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static int64_t apply(Expr::Op op, int64_t a, int64_t b) {
    int64_t r = 0;
    switch (op) {
    case Expr::Op::Add:
        if (__builtin_add_overflow(a, b, &r)) throw EvalError("int64 overflow");
        return r;
    case Expr::Op::Sub:
        if (__builtin_sub_overflow(a, b, &r)) throw EvalError("int64 overflow");
        return r;
    case Expr::Op::Mul:
        if (__builtin_mul_overflow(a, b, &r)) throw EvalError("int64 overflow");
        return r;
    case Expr::Op::FloorDiv: return floor_div(a, b);
    case Expr::Op::Mod: return floor_mod(a, b);
    case Expr::Op::Max: return std::max(a, b);
    case Expr::Op::Min: return std::min(a, b);
    case Expr::Op::Const:
    case Expr::Op::Sym: break;
    }
    throw EvalError("not a binary operator");
}

Expr Expr::constant(int64_t v) {
    Expr e;
    e.code_ = {{Op::Const, v}};
    e.folded_ = v;
    return e;
}

std::string Expr::build(std::vector<Token> code, int n_symbols, Expr& out) {
    int depth = 0;
    bool has_symbol = false;
    for (const Token& t : code) {
        if (t.op == Op::Const) {
            ++depth;
        } else if (t.op == Op::Sym) {
            if (t.value < 0 || t.value >= n_symbols)
                return "symbol $" + std::to_string(t.value) + " is out of range (the program has " +
                       std::to_string(n_symbols) + " symbols)";
            has_symbol = true;
            ++depth;
        } else {
            if (depth < 2) return "an operator lacks its two operands";
            --depth;
        }
    }
    if (depth != 1) return code.empty() ? "the expression is empty" : "the expression leaves " +
                                                                         std::to_string(depth) + " values";
    out.code_ = std::move(code);
    out.folded_.reset();
    if (!has_symbol) {
        try {
            out.folded_ = out.eval(nullptr);
        } catch (const EvalError& e) {
            return e.what();
        }
    }
    return {};
}

int64_t Expr::eval(const int64_t* symbols) const {
    if (folded_) return *folded_;
    int64_t stack[64];
    std::vector<int64_t> deep;  // only for expressions deeper than 64
    int64_t* st = stack;
    if (code_.size() > 64) {
        deep.resize(code_.size());
        st = deep.data();
    }
    size_t sp = 0;
    for (const Token& t : code_) {
        if (t.op == Op::Const) {
            st[sp++] = t.value;
        } else if (t.op == Op::Sym) {
            st[sp++] = symbols[t.value];
        } else {
            int64_t b = st[--sp];
            st[sp - 1] = apply(t.op, st[sp - 1], b);
        }
    }
    return st[0];
}

}  // namespace cuvil
