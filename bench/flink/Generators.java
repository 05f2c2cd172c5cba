package streamtopo.bench;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.functions.TableFunction;
import org.apache.flink.types.Row;

/**
 * streamtopo's trades and quotes generators (streamtopo/runtime/generators.py) as Flink table functions,
 * so a Flink job reads the same records: every field is the same IEEE operations, in the same order, on
 * the same draws, and {@link #uniform} is Spark's {@code shiftrightunsigned(xxhash64(value, salt), 11) *
 * 2^-53}. The salts and the ticker pool come in as arguments, computed by generators.py itself.
 *
 * <p>Why Java and not Flink SQL expressions: Flink's planner inlines a view's expressions into every
 * place that reads them (the symbol index into each of a CASE's sixteen branches, each a hash), so the
 * same fields written in SQL cost Flink several times their work.
 */
public final class Generators {
    private static final long P1 = 0x9E3779B185EBCA87L;
    private static final long P2 = 0xC2B2AE3D27D4EB4FL;
    private static final long P3 = 0x165667B19E3779F9L;
    private static final long P4 = 0x85EBCA77C2B2AE63L;
    private static final long P5 = 0x27D4EB2F165667C5L;

    private Generators() {}

    /** XXH64 (Collet's xxHash specification) of one 8-byte little-endian input: the short-input
     * accumulator, one round, the avalanche. */
    static long xxh64(long input, long seed) {
        long h = seed + P5 + 8L;
        h ^= Long.rotateLeft(input * P2, 31) * P1;
        h = Long.rotateLeft(h, 27) * P1 + P4;
        h ^= h >>> 33;
        h *= P2;
        h ^= h >>> 29;
        h *= P3;
        h ^= h >>> 32;
        return h;
    }

    /** generators.uniform: Spark's {@code xxhash64(value, salt)} folds its arguments into the seed 42. */
    static double uniform(long value, long salt) {
        return (xxh64(salt, xxh64(value, 42L)) >>> 11) * 0x1.0p-53;
    }

    /** generators._round4: Spark's floor of a double is a BIGINT holding the same integer. */
    static double round4(double x) {
        return Math.floor(x * 10000.0 + 0.5) / 10000.0;
    }

    /** generators._mid. */
    static double mid(long idx, double ts, long seq, long[] salts) {
        double base = 20.0 + 480.0 * uniform(idx, salts[7]);
        double phase = ts / 600.0 + idx * 0.6180339887498949;
        double wave = 4.0 * Math.abs(phase - Math.floor(phase) - 0.5) - 1.0;
        return base * (1.0 + 0.05 * wave) * (1.0 + 0.004 * (uniform(seq, salts[1]) - 0.5));
    }

    /** generators._symbol_stage with the pool's names only (``keys`` unset: sixteen tickers). */
    static long symbolIndex(long seq, long[] salts, int n) {
        return Math.min((long) Math.floor(uniform(seq, salts[0]) * (double) n), n - 1L);
    }

    /** Arguments shared by both generators: the record's seq, the source's rate, the ticker pool and the
     * salts of streams 0 .. 7 (both comma-separated constants, parsed once). */
    abstract static class Generator extends TableFunction<Row> {
        private String pool;
        private String saltList;
        String[] names;
        long[] salts;

        void parse(String pool, String saltList) {
            if (!pool.equals(this.pool) || !saltList.equals(this.saltList)) {
                this.pool = pool;
                this.saltList = saltList;
                names = pool.split(",");
                String[] parts = saltList.split(",");
                salts = new long[parts.length];
                for (int i = 0; i < parts.length; i++) {
                    salts[i] = Long.parseLong(parts[i]);
                }
            }
        }
    }

    /** generators.trades: (symbol, price, volume). */
    @FunctionHint(output = @DataTypeHint("ROW<symbol STRING, price DOUBLE, volume BIGINT>"))
    public static final class Trades extends Generator {
        public void eval(Long seq, Double rate, String pool, String saltList) {
            parse(pool, saltList);
            long idx = symbolIndex(seq, salts, names.length);
            double price = round4(mid(idx, seq / rate, seq, salts));
            long volume = 1L + (long) Math.floor(uniform(seq, salts[2]) * 1000.0);
            collect(Row.of(names[(int) idx], price, volume));
        }
    }

    /** generators.quotes: (symbol, bid, ask, volume). */
    @FunctionHint(output = @DataTypeHint("ROW<symbol STRING, bid DOUBLE, ask DOUBLE, volume BIGINT>"))
    public static final class Quotes extends Generator {
        public void eval(Long seq, Double rate, String pool, String saltList) {
            parse(pool, saltList);
            long idx = symbolIndex(seq, salts, names.length);
            double mid = mid(idx, seq / rate, seq, salts);
            double spread = 0.0002 + 0.001 * uniform(seq, salts[3]);
            long volume = 100L * (1L + (long) Math.floor(uniform(seq, salts[2]) * 50.0));
            collect(Row.of(names[(int) idx], round4(mid * (1.0 - spread / 2.0)),
                round4(mid * (1.0 + spread / 2.0)), volume));
        }
    }

    /** The self-check run when the bench compiles this file: Spark's values of {@code
     * xxhash64(id, -2152535657050944081L)} (generators.salt(0, 0)) for id = -1 .. 3. */
    public static void main(String[] args) {
        long salt = -2152535657050944081L;
        long[] spark = {6467161054836022172L, 5304703923420951476L, -4736336293363311904L,
            -4793989919326220534L, -5505496561017818599L};
        for (int i = 0; i < spark.length; i++) {
            long got = xxh64(salt, xxh64(i - 1, 42L));
            if (got != spark[i]) {
                throw new AssertionError("xxhash64(" + (i - 1) + ") = " + got + ", Spark: " + spark[i]);
            }
        }
    }
}
